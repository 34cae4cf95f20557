"""The prepared-data contract every stage shares: the directory layout and columns
(``schema``), the protocol's arithmetic (split sizes, R* and its Z rule, seeded negative draws, the
top-K cut-offs: ``protocol``), the ranking metrics' definitions (``metrics``), what makes a
directory complete (``files``), where files are (local paths and URIs: ``uri``), the reader
(``reader``) and the errors users act on (``errors``).
It imports nothing else of the project."""
