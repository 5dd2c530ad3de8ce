"""The PySide6 desktop app. The only package that imports Qt; it draws what the services report."""
