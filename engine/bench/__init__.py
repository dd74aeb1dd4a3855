"""The bench: what to compare (spec), one runner (runner), openvino_genai peers (peers), the report
(report: Markdown, CSV, JSON), prompt sets (datasets) and `dflash-studio bench`'s options (cli)."""
