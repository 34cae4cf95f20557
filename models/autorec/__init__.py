"""The AutoRec family: its model (``model``), how it trains (``training``: the modes as phases,
fine-tune's ridge start, its flags and data statistics), its losses (``losses``: the MSE objective
once, with its dense reference, and negative sampling) and the ridge solve (``ridge``). Training
reaches all of it through ``Recommender.trainer``, never by name."""

from models.autorec.model import (
                                  LAM_UNITS,
                                  AutoRec,
                                  NCEAutoRec,
                                  NSAutoRec,
                                  OHNSAutoRec,
                                  head_loss,
                                  linear_head_loss,
)
from models.autorec.training import MODES, Step

__all__ = ["LAM_UNITS", "MODES", "AutoRec", "NCEAutoRec", "NSAutoRec", "OHNSAutoRec", "Step",
           "head_loss", "linear_head_loss"]
