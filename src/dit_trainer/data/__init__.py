"""Training data: latent datasets in each supported layout, and the digits for the demo."""

from dit_trainer.data.latents import FastDiTFeatures, NpyLatentFolder, open_latent_dataset
from dit_trainer.data.digits import DigitsDataset, classify_images, digits_classifier
