"""One reader per launcher family: pure functions ``Mapping[str, str] -> DistEnv | None``.

A reader returns None when its launcher's variables are absent, a `DistEnv` when they are present and
consistent, and raises `LaunchError` (naming the variable and value) when they are present but wrong.
No reader touches os.environ, the network or torch; `slurmdist.detect` decides which one to believe.
"""
