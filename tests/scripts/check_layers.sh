#!/bin/bash
# The layering check (tools/check_layers.py): no include from a lower layer to a higher one and no
# include cycle between modules, over src/ and tools/.
# Usage: bash tests/scripts/check_layers.sh [LILY_BIN (unused)]
command -v python3 >/dev/null || { echo "SKIP: python3 absent"; exit 77; }
exec python3 tools/check_layers.py .
