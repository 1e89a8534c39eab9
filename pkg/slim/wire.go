package slim

import (
	"errors"
	"fmt"
	"io"
)

// A reader of the protocol buffers wire format, as far as the Kubernetes
// API's generated (gogo) Unmarshal methods read it: the same errors for
// truncated input, lengths out of range and over-long varints, the same
// skipping of unknown fields (groups included), and the same wire types
// required of known fields. Fields are read in order and later ones
// overwrite earlier ones, as there.

var (
	errOverflow   = errors.New("proto: integer overflow")
	errBadLength  = errors.New("proto: negative length found during unmarshaling")
	errEndOfGroup = errors.New("proto: unexpected end of group")
)

// Wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireStart   = 3
	wireEnd     = 4
	wireFixed32 = 5
)

// pb reads one message's fields in order:
//
//	p := pb{b: b, msg: "PodIP"}
//	for p.next() {
//		switch p.f {
//		case 1:
//			ip = p.str()
//		default:
//			p.skipField()
//		}
//	}
//	return p.err
//
// The first error sticks: it ends the loop, and reads after it return zero
// values.
type pb struct {
	b   []byte
	i   int
	msg string
	// f and w are the current field's number and wire type.
	f   int32
	w   int
	err error
}

func (p *pb) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}

// next reads the next field's key; false at the end or after an error.
func (p *pb) next() bool {
	if p.err != nil || p.i >= len(p.b) {
		return false
	}
	f, w, err := p.key(p.msg)
	if err != nil {
		p.fail(err)
		return false
	}
	p.f, p.w = f, w
	return true
}

// skipField skips the current field's value.
func (p *pb) skipField() { p.fail(p.skip(p.w)) }

// str reads the current field as a string.
func (p *pb) str() string {
	if err := want(p.msg, p.f, p.w, wireBytes); err != nil {
		p.fail(err)
		return ""
	}
	b, err := p.bytes()
	p.fail(err)
	return string(b)
}

// sub reads the current field as an embedded message's bytes.
func (p *pb) sub() []byte {
	if err := want(p.msg, p.f, p.w, wireBytes); err != nil {
		p.fail(err)
		return nil
	}
	b, err := p.bytes()
	p.fail(err)
	return b
}

// num reads the current field as a varint.
func (p *pb) num() uint64 {
	if err := want(p.msg, p.f, p.w, wireVarint); err != nil {
		p.fail(err)
		return 0
	}
	v, err := p.varint()
	p.fail(err)
	return v
}

// varint reads a base-128 varint; bits beyond 64 are dropped, as the
// generated code does.
func (p *pb) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= 64 {
			return 0, errOverflow
		}
		if p.i >= len(p.b) {
			return 0, io.ErrUnexpectedEOF
		}
		c := p.b[p.i]
		p.i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, nil
		}
	}
}

// key reads a field's number and wire type. An end-group marker where a
// field is expected is an error, as in the generated code.
func (p *pb) key(msg string) (field int32, wire int, err error) {
	k, err := p.varint()
	if err != nil {
		return 0, 0, err
	}
	field, wire = int32(k>>3), int(k&7)
	if wire == wireEnd {
		return 0, 0, fmt.Errorf("proto: %s: wiretype end group for non-group", msg)
	}
	if field <= 0 {
		return 0, 0, fmt.Errorf("proto: %s: illegal tag %d (wire type %d)", msg, field, wire)
	}
	return field, wire, nil
}

// bytes reads a length-delimited field's contents (not copied).
func (p *pb) bytes() ([]byte, error) {
	n, err := p.varint()
	if err != nil {
		return nil, err
	}
	l := int(n)
	if l < 0 {
		return nil, errBadLength
	}
	end := p.i + l
	if end < 0 {
		return nil, errBadLength
	}
	if end > len(p.b) {
		return nil, io.ErrUnexpectedEOF
	}
	out := p.b[p.i:end]
	p.i = end
	return out, nil
}

// want checks a known field's wire type.
func want(msg string, field int32, wire, want int) error {
	if wire != want {
		return fmt.Errorf("proto: wrong wireType = %d for field %d of %s", wire, field, msg)
	}
	return nil
}

// skip skips the value of a field of the given wire type (the key already
// read), groups included.
func (p *pb) skip(wire int) error {
	depth := 0
	for {
		switch wire {
		case wireVarint:
			if _, err := p.varint(); err != nil {
				return err
			}
		case wireFixed64:
			if p.i+8 > len(p.b) {
				return io.ErrUnexpectedEOF
			}
			p.i += 8
		case wireBytes:
			if _, err := p.bytes(); err != nil {
				return err
			}
		case wireStart:
			depth++
		case wireEnd:
			if depth == 0 {
				return errEndOfGroup
			}
			depth--
		case wireFixed32:
			if p.i+4 > len(p.b) {
				return io.ErrUnexpectedEOF
			}
			p.i += 4
		default:
			return fmt.Errorf("proto: illegal wireType %d", wire)
		}
		if depth == 0 {
			return nil
		}
		k, err := p.varint()
		if err != nil {
			return err
		}
		wire = int(k & 7)
	}
}
