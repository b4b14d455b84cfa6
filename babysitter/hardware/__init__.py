"""Facts about the hardware, as data with no I/O: the XID catalog and the hardware profiles.
The config validates against them; the checks apply them."""
