"""The reference backend's TransformerEngine stand-in, in pure PyTorch: quantized formats from
their definitions (``formats/``), a quantized tensor subclass with the dispatch ops FSDP2 and DCP
use (``qtensor.py``), TE-style modules doing their own TP (``modules.py``, ``build.py``), and
each seed TE fix as a small toggleable module (``fixes/``). Receives cases' dims and recipes;
hands modules and tensors to the backends stage."""
