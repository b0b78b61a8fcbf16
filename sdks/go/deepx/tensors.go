package deepx

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Values are a tensor's values with its shape and dtype. Data is a slice of the dtype's Go
// type: []float32, []float64, []int8, []int16, []int32, []int64, []uint8, []uint16,
// []uint32, []uint64; bool is []bool; float16 and bfloat16 are []uint16 of their 16-bit
// patterns (ToFloat32 converts).
type Values struct {
	Shape []int
	Dtype string
	Data  any
}

var datatypes = map[string]string{"bool": "BOOL", "int8": "INT8", "int16": "INT16",
	"int32": "INT32", "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16",
	"uint32": "UINT32", "uint64": "UINT64", "float16": "FP16", "bfloat16": "BF16",
	"float32": "FP32", "float64": "FP64"}

func size(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// raw is the values' little-endian bytes (the protocol's binary data).
func (v Values) raw() ([]byte, error) {
	le := binary.LittleEndian
	var out []byte
	count := -1
	switch d := v.Data.(type) {
	case []float32:
		count, out = len(d), make([]byte, 4*len(d))
		for i, x := range d {
			le.PutUint32(out[4*i:], math.Float32bits(x))
		}
	case []float64:
		count, out = len(d), make([]byte, 8*len(d))
		for i, x := range d {
			le.PutUint64(out[8*i:], math.Float64bits(x))
		}
	case []int8:
		count, out = len(d), make([]byte, len(d))
		for i, x := range d {
			out[i] = byte(x)
		}
	case []int16:
		count, out = len(d), make([]byte, 2*len(d))
		for i, x := range d {
			le.PutUint16(out[2*i:], uint16(x))
		}
	case []int32:
		count, out = len(d), make([]byte, 4*len(d))
		for i, x := range d {
			le.PutUint32(out[4*i:], uint32(x))
		}
	case []int64:
		count, out = len(d), make([]byte, 8*len(d))
		for i, x := range d {
			le.PutUint64(out[8*i:], uint64(x))
		}
	case []uint8:
		count, out = len(d), append([]byte{}, d...)
	case []uint16:
		count, out = len(d), make([]byte, 2*len(d))
		for i, x := range d {
			le.PutUint16(out[2*i:], x)
		}
	case []uint32:
		count, out = len(d), make([]byte, 4*len(d))
		for i, x := range d {
			le.PutUint32(out[4*i:], x)
		}
	case []uint64:
		count, out = len(d), make([]byte, 8*len(d))
		for i, x := range d {
			le.PutUint64(out[8*i:], x)
		}
	case []bool:
		count, out = len(d), make([]byte, len(d))
		for i, x := range d {
			if x {
				out[i] = 1
			}
		}
	default:
		return nil, &Error{Kind: "InputError", Message: fmt.Sprintf("a tensor's data is %T, not a slice of a dtype's values", v.Data)}
	}
	if want, ok := goType[v.Dtype]; !ok || want != fmt.Sprintf("%T", v.Data) {
		return nil, &Error{Kind: "InputError", Message: fmt.Sprintf("dtype %s holds %s, not %T", v.Dtype, goType[v.Dtype], v.Data)}
	}
	if count != size(v.Shape) {
		return nil, &Error{Kind: "InputError", Message: fmt.Sprintf("%d values, but shape %v holds %d", count, v.Shape, size(v.Shape))}
	}
	return out, nil
}

var goType = map[string]string{"bool": "[]bool", "int8": "[]int8", "int16": "[]int16",
	"int32": "[]int32", "int64": "[]int64", "uint8": "[]uint8", "uint16": "[]uint16",
	"uint32": "[]uint32", "uint64": "[]uint64", "float16": "[]uint16", "bfloat16": "[]uint16",
	"float32": "[]float32", "float64": "[]float64"}

// fromRaw is the values of dtype and shape in little-endian bytes.
func fromRaw(dtype string, shape []int, b []byte) (Values, error) {
	le := binary.LittleEndian
	n := size(shape)
	width := map[string]int{"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2,
		"float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4, "int64": 8,
		"uint64": 8, "float64": 8}[dtype]
	if width == 0 || len(b) != n*width {
		return Values{}, &Error{Kind: "RemoteError", Message: fmt.Sprintf("the gateway sent %d bytes for %s%v", len(b), dtype, shape)}
	}
	v := Values{Shape: shape, Dtype: dtype}
	switch dtype {
	case "float32":
		d := make([]float32, n)
		for i := range d {
			d[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
		v.Data = d
	case "float64":
		d := make([]float64, n)
		for i := range d {
			d[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		}
		v.Data = d
	case "int8":
		d := make([]int8, n)
		for i := range d {
			d[i] = int8(b[i])
		}
		v.Data = d
	case "int16":
		d := make([]int16, n)
		for i := range d {
			d[i] = int16(le.Uint16(b[2*i:]))
		}
		v.Data = d
	case "int32":
		d := make([]int32, n)
		for i := range d {
			d[i] = int32(le.Uint32(b[4*i:]))
		}
		v.Data = d
	case "int64":
		d := make([]int64, n)
		for i := range d {
			d[i] = int64(le.Uint64(b[8*i:]))
		}
		v.Data = d
	case "uint8":
		v.Data = append([]uint8{}, b...)
	case "uint16", "float16", "bfloat16":
		d := make([]uint16, n)
		for i := range d {
			d[i] = le.Uint16(b[2*i:])
		}
		v.Data = d
	case "uint32":
		d := make([]uint32, n)
		for i := range d {
			d[i] = le.Uint32(b[4*i:])
		}
		v.Data = d
	case "uint64":
		d := make([]uint64, n)
		for i := range d {
			d[i] = le.Uint64(b[8*i:])
		}
		v.Data = d
	case "bool":
		d := make([]bool, n)
		for i := range d {
			d[i] = b[i] != 0
		}
		v.Data = d
	}
	return v, nil
}

// ToFloat32 is the values of a float16 or bfloat16 tensor as float32.
func ToFloat32(v Values) ([]float32, error) {
	bits, ok := v.Data.([]uint16)
	if !ok || (v.Dtype != "float16" && v.Dtype != "bfloat16") {
		return nil, &Error{Kind: "InputError", Message: fmt.Sprintf("%s is not a 16-bit float", v.Dtype)}
	}
	out := make([]float32, len(bits))
	for i, b := range bits {
		if v.Dtype == "bfloat16" {
			out[i] = math.Float32frombits(uint32(b) << 16)
			continue
		}
		sign := float64(1)
		if b&0x8000 != 0 {
			sign = -1
		}
		exponent, fraction := int(b>>10)&0x1f, float64(b&0x3ff)
		switch exponent {
		case 0:
			out[i] = float32(sign * math.Ldexp(fraction/1024, -14))
		case 31:
			if fraction != 0 {
				out[i] = float32(math.NaN())
			} else {
				out[i] = float32(math.Inf(int(sign)))
			}
		default:
			out[i] = float32(sign * math.Ldexp(1+fraction/1024, exponent-15))
		}
	}
	return out, nil
}
