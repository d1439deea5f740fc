#!/usr/bin/env bash
# Kept at this path for the lent GPU machine's instructions; the check lives in tools/ (tools/README.md).
exec bash "$(dirname "$0")/../tools/device_gpu_check.sh" "$@"
