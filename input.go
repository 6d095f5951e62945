package atomicphase

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/atomicphase/atomicphase/internal/fingerprint"
)

// decodeInput decodes a request's JSON parameters into in, a pointer to the
// workflow's input type. Empty parameters leave in at its zero value. The
// decoding is strict where encoding/json is lenient: a member whose name
// matches a field's only when case is ignored is an error, since the
// fingerprint tells "quantity" and "Quantity" apart and the decoded input
// must not. Members that match no field are allowed (they are part of the
// fingerprint all the same).
func decodeInput(params []byte, in any) error {
	if len(bytes.TrimSpace(params)) == 0 {
		return nil
	}
	if err := json.Unmarshal(params, in); err != nil {
		return inputError(err)
	}
	t := reflect.TypeOf(in).Elem()
	if spelledExactly(params, t) {
		return nil
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return inputError(err)
	}
	if err := checkExactNames(doc, t, ""); err != nil {
		return &InvalidInputError{Reason: err.Error()}
	}
	return nil
}

var (
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
)

// checkExactNames walks a decoded document beside the Go type it was decoded
// into and reports the first member that reached a struct field by a
// case-insensitive match.
func checkExactNames(doc any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		return nil // the type decodes itself
	}
	switch v := doc.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Struct:
			fields := fieldsOf(t)
			for name, member := range v {
				f, ok := fields.exact[name]
				if !ok {
					if want, folded := fields.folded[fingerprint.FoldName(name)]; folded {
						return fmt.Errorf("member %q%s does not match field %q: member names are case-sensitive", name, at(path), want)
					}
					continue
				}
				if err := checkExactNames(member, f, path+"."+name); err != nil {
					return err
				}
			}
		case reflect.Map:
			for name, member := range v {
				if err := checkExactNames(member, t.Elem(), path+"."+name); err != nil {
					return err
				}
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, elem := range v {
				if err := checkExactNames(elem, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func at(path string) string {
	if path == "" {
		return ""
	}
	return " at " + strings.TrimPrefix(path, ".")
}

// structFields are the JSON names of a struct's fields, as encoding/json
// matches them: exactly, and folded for the lenient match.
type structFields struct {
	exact  map[string]reflect.Type
	folded map[string]string
}

var fieldCache sync.Map // reflect.Type → *structFields

func fieldsOf(t reflect.Type) *structFields {
	if f, ok := fieldCache.Load(t); ok {
		return f.(*structFields)
	}
	f := &structFields{exact: map[string]reflect.Type{}, folded: map[string]string{}}
	collectFields(t, f, 0)
	fieldCache.Store(t, f)
	return f
}

func collectFields(t reflect.Type, f *structFields, depth int) {
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := sf.Type
		if sf.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct && depth < 8 {
				collectFields(et, f, depth+1) // promoted fields
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		if _, dup := f.exact[name]; !dup {
			f.exact[name] = ft
			f.folded[fingerprint.FoldName(name)] = name
		}
	}
}

// spelledExactly reports, without decoding params, that no member of it
// can reach a field of t by a case-insensitive match only, so that
// checkExactNames would find nothing: every string in the document (names
// and values alike) is ASCII without escapes, and either folds to no field
// name of any struct t reaches, or is the one spelling those field names
// have for its folding. false means "decode and look", never an error.
// It spares the common request a second decoding.
func spelledExactly(params []byte, t reflect.Type) bool {
	names := spellingsOf(t)
	var buf [64]byte
	for i := 0; i < len(params); i++ {
		if params[i] != '"' {
			continue
		}
		j := i + 1
		for ; j < len(params) && params[j] != '"'; j++ {
			if c := params[j]; c == '\\' || c >= 0x80 {
				return false
			}
		}
		if j >= len(params) || j-i-1 > len(buf) {
			return false
		}
		str := params[i+1 : j]
		for k, c := range str { // FoldName of ASCII: upper case
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			buf[k] = c
		}
		if spelling, ok := names[string(buf[:len(str)])]; ok && spelling != string(str) {
			return false
		}
		i = j
	}
	return true
}

// spellingsOf maps the folding (fingerprint.FoldName) of every JSON field
// name of every struct t reaches to its spelling, or to "" when two fields
// spell one folding differently (no string is then the one spelling).
func spellingsOf(t reflect.Type) map[string]string {
	if m, ok := spellingCache.Load(t); ok {
		return m.(map[string]string)
	}
	m := map[string]string{}
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if seen[t] {
			return
		}
		seen[t] = true
		switch t.Kind() {
		case reflect.Slice, reflect.Array, reflect.Map:
			walk(t.Elem())
		case reflect.Struct:
			for name, ft := range fieldsOf(t).exact {
				folded := fingerprint.FoldName(name)
				if have, ok := m[folded]; ok && have != name {
					m[folded] = ""
				} else {
					m[folded] = name
				}
				walk(ft)
			}
		}
	}
	walk(t)
	spellingCache.Store(t, m)
	return m
}

var spellingCache sync.Map // reflect.Type → map[string]string

// InvalidInputError is the error a start function returns to refuse a
// request with a reason its client may read (Invalid makes one). Run
// answers it with ErrInvalidRequest (422 over HTTP) and the reason.
type InvalidInputError struct {
	// Reason says what is wrong with the request, for its client.
	Reason string
}

func (e *InvalidInputError) Error() string { return e.Reason }

// Invalid returns an *InvalidInputError whose reason is the formatted
// message: what a start function returns to tell the client why its
// request is refused ("amount must be positive").
func Invalid(format string, args ...any) error {
	return &InvalidInputError{Reason: fmt.Sprintf(format, args...)}
}

// inputError rewords a failure to decode a request's body into the
// workflow's input type in the library's words: encoding/json's name Go
// types.
func inputError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return Invalid("member %q is a JSON %s, which the request does not take there", typeErr.Field, typeErr.Value)
	case errors.As(err, &typeErr):
		return Invalid("the body is a JSON %s; the request takes another kind of value", typeErr.Value)
	case errors.As(err, &syntaxErr):
		return Invalid("the body is not valid JSON (at byte %d)", syntaxErr.Offset)
	}
	return Invalid("the body does not decode into the request's input")
}
