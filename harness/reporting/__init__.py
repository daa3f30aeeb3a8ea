"""Report a run: timeline and latency plots, Allure attachments, and the offline HTML report."""
