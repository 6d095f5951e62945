package atomicphase

import "github.com/atomicphase/atomicphase/internal/fingerprint"

// Fingerprint is the SHA-256 of what identifies a request. A key reused with
// another fingerprint is misuse, never a replay.
type Fingerprint [fingerprint.Size]byte

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
	fp, err := fingerprint.Of(method, path, params)
	return Fingerprint(fp), err
}

// MaxJSONDepth is how deeply CanonicalJSON lets arrays and objects nest; a
// document nested deeper is an error. Request parameters nest a few levels,
// so 128 refuses no real request; it is serde_json's default limit too, and
// below encoding/json's 10 000, so whatever CanonicalJSON accepts the
// Runner can decode. The limit bounds the canonicaliser's stack and its
// worst case: putting members in order moves a byte once for each object
// around it, so no document costs more than 128 passes over it.
const MaxJSONDepth = fingerprint.MaxJSONDepth

// CanonicalJSON returns the RFC 8785 canonical form of a JSON document:
// members sorted by the UTF-16 code units of their names, insignificant
// whitespace removed, strings escaped only where they must be, numbers
// written the way ECMAScript writes the double they name. Empty or
// all-whitespace input canonicalises to empty output.
//
// It accepts only documents that every later reader sees the way the
// canonical form does, and returns an error for
//
//   - arrays and objects nested deeper than MaxJSONDepth, answered as soon
//     as the limit is passed;
//   - a number not numerically equal to the shortest form of the double
//     closest to it, so that two numbers naming one double could differ:
//     9007199254740993, 0.10000000000000000001 and 1e-400 are errors, 0.1,
//     1.50 and 15e-1 (all written 1.5) are not. Such numbers must be sent
//     as strings. A number beyond the double range (1e400) is an error too;
//   - an object with two member names equal under Unicode simple case
//     folding (strings.EqualFold), exact duplicates included, at any depth,
//     since encoding/json matches names to fields ignoring case;
//   - a string or member name holding U+0000, which PostgreSQL text cannot
//     store, or an unpaired surrogate escape such as "\ud800", which is no
//     character (encoding/json would quietly read U+FFFD);
//   - anything else that is not one JSON value in valid UTF-8, trailing
//     data included.
//
// It reads the document once, in time linear in its length: objects out of
// order are rewritten in place, which for objects nested in objects
// multiplies the work by at most twice MaxJSONDepth.
func CanonicalJSON(doc []byte) ([]byte, error) {
	return fingerprint.CanonicalJSON(doc)
}
