"""The rules of chat datasets: formats and conversions, per-row checks, duplicates, splits, reports. No I/O."""
