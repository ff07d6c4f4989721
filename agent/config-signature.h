/* SPDX-License-Identifier: MIT */
/* Owns checking the detached signature of the remote configuration document (config.remote.signing-key):
 * a signature over the document's exact bytes with the fleet's private key, checked with the public key
 * on the node through OpenSSL libcrypto's EVP interface. libcrypto is dlopen()ed on first use, as libcurl
 * is (config-remote.c), and never linked. Pure functions of their arguments and the key file; the
 * Manager (manager-remote.c) decides what a verdict means for the node.
 *
 * Keys (PEM "BEGIN PUBLIC KEY", as `openssl pkey -pubout` writes them) and how each signs:
 *   Ed25519 (recommended), Ed448   the document itself (`openssl pkeyutl -sign -rawin`)
 *   ECDSA (P-256, P-384, P-521)     its SHA-256 (`openssl dgst -sha256 -sign`)
 *   RSA, 2048 bits or more          its SHA-256, PKCS #1 v1.5 (`openssl dgst -sha256 -sign`)
 * The signature file is the raw signature or its base64 (whitespace and line breaks ignored). */
#pragma once

#include <stddef.h>

/* Reads the public key in path and checks that it is one of the kinds above. On failure returns a
 * negative errno and sets *ret_msg to one line that starts with the path and says what to do. */
int config_signature_key_check(const char *path, char **ret_msg);

/* Checks sig (sig_size bytes, raw or base64) over data with the key in key_path. 0: it verifies.
 * -EBADMSG: it does not (another key, a changed document or signature, not a signature at all).
 * Other negative errnos: the key cannot be read or used, or libcrypto cannot be loaded. *ret_msg says
 * which, in words. */
int config_signature_verify(const char *key_path, const void *data, size_t size, const void *sig,
                            size_t sig_size, char **ret_msg);
