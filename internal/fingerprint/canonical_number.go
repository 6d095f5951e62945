package fingerprint

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
)

// number reads the number at c.pos and writes it the way ECMAScript's
// Number.prototype.toString writes the double it names, which is what RFC
// 8785 prescribes, provided the number is exactly that double's value.
func (c *canonicaliser) number() error {
	in, start := c.in, c.pos
	i := start
	if in[i] == '-' {
		i++
	}
	var intPart, fracPart, expPart []byte
	switch {
	case i < len(in) && in[i] == '0':
		intPart, i = in[i:i+1], i+1
	case i < len(in) && '1' <= in[i] && in[i] <= '9':
		j := digitsEnd(in, i)
		intPart, i = in[i:j], j
	default:
		return c.badNumber(start, i)
	}
	if i < len(in) && in[i] == '.' {
		j := digitsEnd(in, i+1)
		if j == i+1 {
			return c.badNumber(start, j)
		}
		fracPart, i = in[i+1:j], j
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		e := i + 1
		if e < len(in) && (in[e] == '+' || in[e] == '-') {
			e++
		}
		j := digitsEnd(in, e)
		if j == e {
			return c.badNumber(start, j)
		}
		expPart, i = in[i+1:j], j
	}
	c.pos = i
	lit := in[start:i]
	// Integers of up to 15 digits are below 2^53, so exact, and written as
	// they are.
	if fracPart == nil && expPart == nil && len(intPart) <= 15 {
		if intPart[0] == '0' {
			c.out = append(c.out, '0') // -0 too
		} else {
			c.out = append(c.out, lit...)
		}
		return nil
	}
	return c.appendNumber(lit, intPart, fracPart, expPart)
}

func digitsEnd(in []byte, i int) int {
	for i < len(in) && '0' <= in[i] && in[i] <= '9' {
		i++
	}
	return i
}

// appendNumber checks that lit is exactly the double closest to it and
// writes that double. Both sides are compared as significant digits (no
// leading or trailing zeros) and the power of ten of the last one.
func (c *canonicaliser) appendNumber(lit, intPart, fracPart, expPart []byte) error {
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil && math.IsInf(f, 0) {
		return fmt.Errorf("number %s is outside the IEEE 754 double range", lit)
	}
	var digits [17]byte // a double never needs more
	n, zeros, tooLong := 0, 0, false
	for _, part := range [2][]byte{intPart, fracPart} {
		for _, d := range part {
			switch {
			case d == '0' && n == 0: // leading
			case d == '0':
				zeros++
			case n+zeros >= len(digits):
				tooLong = true
			default:
				for ; zeros > 0; zeros-- {
					digits[n] = '0'
					n++
				}
				digits[n] = d
				n++
			}
		}
	}
	if n == 0 && !tooLong {
		c.out = append(c.out, '0') // any zero, -0 included
		return nil
	}
	// The literal's value is digits[:n] × 10^exp.
	exp := zeros - len(fracPart)
	if len(expPart) > 0 {
		e, neg := 0, expPart[0] == '-'
		for _, d := range expPart {
			if '0' <= d && d <= '9' && e < 1<<40 {
				e = e*10 + int(d-'0')
			}
		}
		if neg {
			e = -e
		}
		exp += e
	}
	// The double's shortest form: d.ddde±x, or -d.ddde±x.
	var buf [32]byte
	short := strconv.AppendFloat(buf[:0], math.Abs(f), 'e', -1, 64)
	e := bytes.IndexByte(short, 'e')
	mant, x := short[:e], 0
	for _, d := range short[e+2:] {
		x = x*10 + int(d-'0')
	}
	if short[e+1] == '-' {
		x = -x
	}
	var sig [17]byte
	k := copy(sig[:], mant[:1])
	if len(mant) > 2 {
		k += copy(sig[1:], mant[2:])
	}
	if tooLong || f == 0 || !bytes.Equal(sig[:k], digits[:n]) || x-(k-1) != exp {
		return fmt.Errorf("number %s cannot be represented exactly as an IEEE 754 double; send it as a string", lit)
	}
	if f < 0 {
		c.out = append(c.out, '-')
	}
	c.appendES(sig[:k], x+1)
	return nil
}

// appendES writes digits × 10^(point-len(digits)) as ECMAScript's
// Number.prototype.toString does: plain up to 21 integer digits and down to
// 0.000001, else d.ddde±x.
func (c *canonicaliser) appendES(digits []byte, point int) {
	k := len(digits)
	switch {
	case k <= point && point <= 21:
		c.out = append(c.out, digits...)
		for range point - k {
			c.out = append(c.out, '0')
		}
	case 0 < point && point <= 21:
		c.out = append(c.out, digits[:point]...)
		c.out = append(c.out, '.')
		c.out = append(c.out, digits[point:]...)
	case -6 < point && point <= 0:
		c.out = append(c.out, '0', '.')
		for range -point {
			c.out = append(c.out, '0')
		}
		c.out = append(c.out, digits...)
	default:
		c.out = append(c.out, digits[0])
		if k > 1 {
			c.out = append(c.out, '.')
			c.out = append(c.out, digits[1:]...)
		}
		c.out = append(c.out, 'e')
		if point-1 >= 0 {
			c.out = append(c.out, '+')
		}
		c.out = strconv.AppendInt(c.out, int64(point-1), 10)
	}
}
