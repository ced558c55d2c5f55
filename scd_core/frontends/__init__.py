"""Front ends: `python -m scd_core` (cli: generate and --compare), the arguments its commands share
(cli_shared), `python -m scd_core batch` (batch_job: a resumable folder of images, in-process or on Ray) and
`python -m scd_core fetch` (fetch_command: a published model from the Hugging Face hub) and
`python -m scd_core story` (story_job: an Emu3.5 story's text and images into a folder).

Imports any layer but bench/; nothing imports it but scd_core/__main__.py."""
