"""pepctl: the control plane of the PEP appliance."""
