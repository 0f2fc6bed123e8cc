"""The demo: the appliance in the one-host lab, with real traffic (python -m demo; scripts/demo)."""
