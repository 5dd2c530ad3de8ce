"""The pages of the main window, one module each."""
