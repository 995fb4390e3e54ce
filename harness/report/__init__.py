"""What a person reads: progress and the summary tables of a bench (summary), verdicts as text and JSON
(verdicts), the nightly report in Markdown and HTML (nightly), the busbw plot (plot)."""
