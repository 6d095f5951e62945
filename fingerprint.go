package atomicphase

import (
	"crypto/sha256"
	"encoding/binary"
)

// Fingerprint is the SHA-256 of what identifies a request. A key reused with
// another fingerprint is misuse, never a replay.
type Fingerprint [sha256.Size]byte

// FingerprintOf returns the fingerprint of a request's method, path and JSON
// parameters. The parameters are canonicalised first (RFC 8785: members
// sorted by their UTF-16 code units, insignificant whitespace removed,
// numbers written as the shortest form that round-trips an IEEE 754 double),
// so reordering members or re-spacing the document never changes the
// fingerprint, while any changed value does. Empty params fingerprint as no
// parameters.
//
// Params the fingerprint could not tell apart from others that decode
// differently are an error, as CanonicalJSON details: nesting deeper than
// MaxJSONDepth; a number that is not exactly a double's value
// (9007199254740993, 0.10000000000000000001: send those as strings) or is
// beyond the double range; two member names of one object equal ignoring
// case (strings.EqualFold), since encoding/json matches fields that way; a
// string holding U+0000 or an unpaired surrogate escape; and anything that
// is not one JSON value in valid UTF-8. The Runner answers such params with
// ErrInvalidRequest.
func FingerprintOf(method, path string, params []byte) (Fingerprint, error) {
	canon, err := CanonicalJSON(params)
	if err != nil {
		return Fingerprint{}, err
	}
	return Fingerprint(hashParts("atomicphase-fingerprint-v1", method, path, string(canon))), nil
}

// hashParts hashes each part behind its length, so no two distinct lists of
// parts collide by concatenation ("ab","c" versus "a","bc"). The parts are
// laid out in one buffer (on the stack when they are short) and hashed at
// once: no hasher is allocated.
func hashParts(parts ...string) [sha256.Size]byte {
	var stack [512]byte
	buf := stack[:0]
	for _, part := range parts {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(part)))
		buf = append(buf, part...)
	}
	return sha256.Sum256(buf)
}
