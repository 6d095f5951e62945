// Package fingerprint computes what identifies a request: the RFC 8785
// canonical form of its JSON parameters (CanonicalJSON) and the SHA-256 of
// its method, path and that form (Of). The root package re-exports both as
// atomicphase.CanonicalJSON and atomicphase.FingerprintOf; the downstream
// keys of foreign calls are hashed with the same length-prefixed layout
// (HashParts).
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
)

// Size is a fingerprint's length in bytes.
const Size = sha256.Size

// Of returns the fingerprint of a request's method, path and JSON
// parameters, canonicalised first (see CanonicalJSON, whose errors it
// returns).
func Of(method, path string, params []byte) ([Size]byte, error) {
	canon, err := CanonicalJSON(params)
	if err != nil {
		return [Size]byte{}, err
	}
	return HashParts("atomicphase-fingerprint-v1", method, path, string(canon)), nil
}

// HashParts hashes each part behind its length, so no two distinct lists of
// parts collide by concatenation ("ab","c" versus "a","bc"). The parts are
// laid out in one buffer (on the stack when they are short) and hashed at
// once: no hasher is allocated.
func HashParts(parts ...string) [Size]byte {
	var stack [512]byte
	buf := stack[:0]
	for _, part := range parts {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(part)))
		buf = append(buf, part...)
	}
	return sha256.Sum256(buf)
}
