"""The build pipeline: which stages run (``stage``), their cache (``cache``), stages in
processes of their own (``isolate``), each stage reused or run and measured (``stage_runs``)
and the runner that ties them together and writes OUT (``runner``)."""
