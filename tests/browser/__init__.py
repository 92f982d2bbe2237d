"""Browser tests: the orchestrators' pages in headless Chromium (issue 37 §2)."""
