"""What the ops' adapters share (``protocol``: a limitation of a foreign API, the error of
a callable no adapter fits) and the stand-ins for the imports of a kernel file loaded
outside its project (``shims``). Each op's adapters live in its package
(``dcpcheck.ops.<op>``)."""
