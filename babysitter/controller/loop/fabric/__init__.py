"""Fabric: incidents over a group of nodes, by switch and by NVLink domain."""
