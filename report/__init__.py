"""Report: tables -> six-section engineering note (Markdown, HTML, PDF).

Importing the package loads nothing heavy: `report --help` answers before pandas, matplotlib or
torch are imported (report.cli imports report.render inside the commands)."""

FORMATS = ("md", "html", "pdf")  # the note's output formats, in the order they are written
