"""Generated from proto/tensorops/kserve/v2 by `make proto`; do not edit."""
