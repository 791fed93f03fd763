"""Report: tables -> six-section engineering note (Markdown, HTML, PDF)."""
