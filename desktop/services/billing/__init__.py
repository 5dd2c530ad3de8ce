"""Money: the ledger of every machine rented, what runs cost, what bills now, budgets, and the notices about them."""
