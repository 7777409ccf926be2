"""Adapters to AWS services that run, replace and reboot instances."""
