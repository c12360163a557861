"""Tests of fastrl.adaptive."""
