"""Generated from proto/tensorops/v1 by `make proto`; do not edit."""
