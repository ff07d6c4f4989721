/* SPDX-License-Identifier: MIT */
/* Owns PCI device names (pci-names.c): udev's hwdb, then pci.ids, read only as far as needed. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "macro.h"

typedef struct PciNames PciNames;

/* pci_ids: the configured pci.ids (then the only source), or NULL/"" for the system's sources: udev's
 * hwdb, then /usr/share/misc/pci.ids or /usr/share/hwdata/pci.ids. vendors (kept by reference, not
 * copied) are the vendors whose names a pci.ids read collects. Nothing is opened before the first
 * look-up. */
int pci_names_new(const char *pci_ids, const uint16_t *vendors, size_t n_vendors, PciNames **ret);
PciNames *pci_names_free(PciNames *n);
DEFINE_CLEANUP_FUNC(PciNames *, pci_names_free);

/* Uses the hwdb.bin at hwdb_path instead of the system's (tests). */
int pci_names_open_hwdb(PciNames *n, const char *hwdb_path);

/* The device's name ("GH100 [H100 SXM5 80GB]") in *ret, or NULL when no source knows it. Returns a
 * negative errno only on OOM; an unusable pci.ids is a warning (pci_names_warning()), set once. */
int pci_names_lookup(PciNames *n, uint16_t vendor, uint16_t device, char **ret);

/* Why names are unknown (missing or malformed pci.ids), NULL when nothing went wrong. */
const char *pci_names_warning(const PciNames *n);
/* "hwdb" while a hwdb is open, else the pci.ids path read; NULL before a look-up or with neither. */
const char *pci_names_source(const PciNames *n);
