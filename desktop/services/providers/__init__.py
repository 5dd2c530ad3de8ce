"""GPU clouds (RunPod, Vast.ai, Lambda): offers, renting and stopping machines.

Empty until that work lands; the import contracts already give it its place.
"""
