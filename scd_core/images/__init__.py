"""Images in the prompt: a ComfyUI IMAGE to an encoder's pixels (image_input) and an image into a
conditioning, for the SCD Image Prompt node (image_prompt).

Imports decoding/ (the given cells) and the adapter protocol."""
