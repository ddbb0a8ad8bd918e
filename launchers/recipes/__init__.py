"""Recipes shared by the launchers of several platforms (no launcher lives here)."""
