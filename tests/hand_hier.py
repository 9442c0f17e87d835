"""Moved to the registry (models.py): ``Net``, ``net()``, ``hierarchical()``, ``isolate_call()``.

Kept only for tests/test_validate.py, which still imports it; delete once it imports ``models``.
"""

from models import DIM, DOMAIN, Layer, Lin, Net, hierarchical, isolate_call, net

__all__ = ["DIM", "DOMAIN", "Layer", "Lin", "Net", "hierarchical", "isolate_call", "net"]
