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
	"sync"
)

// Size is a fingerprint's length in bytes.
const Size = sha256.Size

// Of returns the fingerprint of a request's method, path and JSON
// parameters, canonicalised first (see CanonicalJSON, whose errors it
// returns). The canonical form is only hashed, so it is written into a
// buffer reused from one request to the next.
func Of(method, path string, params []byte) ([Size]byte, error) {
	c := canonicalisers.Get().(*canonicaliser)
	defer release(c)
	canon, err := c.canonical(params)
	if err != nil {
		return [Size]byte{}, err
	}
	var stack [512]byte
	buf := appendPart(stack[:0], "atomicphase-fingerprint-v1")
	buf = appendPart(buf, method)
	buf = appendPart(buf, path)
	buf = appendPart(buf, canon)
	return sha256.Sum256(buf), nil
}

// canonicalisers are Of's canonicalisers, with their buffers.
var canonicalisers = sync.Pool{New: func() any { return new(canonicaliser) }}

// maxKeptBuffer and maxKeptMembers bound what a pooled canonicaliser
// keeps: a rare large request's output buffer (bodies up to half of it are
// canonicalised in place) or member scratch (the members of the objects
// open at once) is left to the garbage collector instead of being kept,
// and cleared, for every request after it.
const (
	maxKeptBuffer  = 16 << 10
	maxKeptMembers = 64
)

// release returns c to the pool with its buffers emptied: it keeps
// nothing of the request it read.
func release(c *canonicaliser) {
	c.in = nil
	if cap(c.out) > maxKeptBuffer {
		c.out = nil
	}
	clear(c.out[:cap(c.out)]) // the last canonical form, and the scratch past it
	c.out = c.out[:0]
	if cap(c.members) > maxKeptMembers {
		c.members = nil
	}
	clear(c.members[:cap(c.members)])
	c.members = c.members[:0]
	canonicalisers.Put(c)
}

// HashParts hashes each part behind its length, so no two distinct lists of
// parts collide by concatenation ("ab","c" versus "a","bc"). The parts are
// laid out in one buffer (on the stack when they are short) and hashed at
// once: no hasher is allocated.
func HashParts(parts ...string) [Size]byte {
	var stack [512]byte
	buf := stack[:0]
	for _, part := range parts {
		buf = appendPart(buf, part)
	}
	return sha256.Sum256(buf)
}

// appendPart appends part behind its length, as HashParts lays it out.
func appendPart[T string | []byte](buf []byte, part T) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(len(part)))
	return append(buf, part...)
}
