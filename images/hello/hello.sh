#!/bin/sh
echo "${GREETING:-hello}"
