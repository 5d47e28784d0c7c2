"""Reusable test infrastructure for aios and its plugins (real sshd hosts, ...)."""
