"""Representation alignment (REPA, Yu et al., arXiv 2410.06940): a small MLP on the model's tokens
after one block is pulled, by cosine similarity, towards a frozen vision encoder's patch tokens of
the clean image, beside the denoising loss.

`config` (the `repa:` section, torch-free), `projector` (the model's MLP and the loss), `encoder`
(the frozen encoder and the images it reads) and `objective` (the objective that adds the term).
"""
