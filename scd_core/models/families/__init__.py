"""The families, one module each: janus, llamagen, lumina (1 and 2.0), emu3, emu3p5, cosmos, glm_image and
mammothmoda2 (its token stage); beside emu3p5, its interleaved stories (emu3p5_story, their prompts and reference
images: emu3p5_story_prompt) and the image header a model writes or is given (emu3p5_header); beside
mammothmoda2, the memory of its two stages (mammothmoda2_memory).  Each family declares `FAMILY = Family(...)`
and the hooks `family.FamilyHooks` lists; `family.MODULES` names them.

Imports any part of models/ and the layers below it; families import each other only where one is built on
another (lumina on janus's RowBackbone, cosmos on llamagen's layers and T5 captioner)."""
