"""Front ends: `python -m scd_core` (cli: generate and --compare), the arguments its commands share
(cli_shared) and `python -m scd_core batch` (batch_job: a resumable folder of images, in-process or on Ray).

Imports any layer but bench/; nothing imports it but scd_core/__main__.py."""
