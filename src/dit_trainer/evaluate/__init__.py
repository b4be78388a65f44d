"""Evaluation: FID, sFID, Inception Score, precision and recall as the ADM evaluator measures them.

features.py runs a feature network (inception.py: the FID Inception-v3; digits_net.py: the demo's
digit network) over uint8 images; stats.py keeps their Gaussian fits in ADM's reference layout;
fid.py, inception_score.py and precision_recall.py are the metrics; evaluator.py chains them and
cli.py is `dit eval`. Importing this package imports neither torch nor scipy.
"""

from dit_trainer.evaluate.cli import add_commands

__all__ = ["add_commands"]
