"""The AutoRec family: its model (``model``), its losses (``losses``: the MSE objective once, with
its dense reference, and negative sampling) and fine-tune phase 2's ridge start (``ridge``).
Training reaches all of it through ``models.base.Recommender``'s hooks, never by name."""

from models.autorec.model import (LAM_UNITS, MODES, AutoRec, NCEAutoRec, NSAutoRec, OHNSAutoRec,
                                  Step, head_loss, linear_head_loss)

__all__ = ["LAM_UNITS", "MODES", "AutoRec", "NCEAutoRec", "NSAutoRec", "OHNSAutoRec", "Step",
           "head_loss", "linear_head_loss"]
