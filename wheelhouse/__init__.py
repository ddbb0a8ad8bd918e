"""A wheelhouse for air-gapped GPU nodes: inventory the node, build batches of wheels where PyPI
is reachable, carry them over, install them there.

The node side (`inventory`, `install`, `batches`, `names`) uses only the standard library and
`common` (standard library only too): a bare offline node may not have this project's
dependencies yet.
"""
