"""A test plugin: :mod:`.formats` (checkpoint format ``demo-pickle``), :mod:`.notices` (notice
source ``demo-reclaim``), :mod:`.cloud` (cloud ``demo`` and its declared features)."""
