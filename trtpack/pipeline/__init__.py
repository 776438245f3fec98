"""The build pipeline: which stages run (``stage``), their cache (``cache``), stages in
processes of their own (``isolate``) and the runner that ties them together (``runner``)."""
