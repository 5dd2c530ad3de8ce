"""The GPU check: the real payload on a real GPU, beside what ``rentune plan`` predicts (``make gpu-check``).

``wheels`` brings the packages a network-less GPU image lacks; ``gpu_check`` builds random-weight models of real
shapes, trains them with the payload and writes the comparison. ``--smoke`` runs the same logic on a CPU.
"""
