"""The HAProxy part of the appliance: its config (render), its supervisor (supervise), and its
stats socket (stats). pepctl uses these; they use nothing of pepctl."""
