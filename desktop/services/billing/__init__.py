"""What runs cost: the spending ledger behind the cost meter.

Empty until that work lands; the import contracts already give it its place.
"""
