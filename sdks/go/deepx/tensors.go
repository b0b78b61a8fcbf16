package deepx

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
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

var goType = map[string]string{"bool": "[]bool", "int8": "[]int8", "int16": "[]int16",
	"int32": "[]int32", "int64": "[]int64", "uint8": "[]uint8", "uint16": "[]uint16",
	"uint32": "[]uint32", "uint64": "[]uint64", "float16": "[]uint16", "bfloat16": "[]uint16",
	"float32": "[]float32", "float64": "[]float64"}

// newSlice is an empty slice of n values of dtype's Go type.
func newSlice(dtype string, n int) any {
	switch goType[dtype] {
	case "[]bool":
		return make([]bool, n)
	case "[]int8":
		return make([]int8, n)
	case "[]int16":
		return make([]int16, n)
	case "[]int32":
		return make([]int32, n)
	case "[]int64":
		return make([]int64, n)
	case "[]uint8":
		return make([]uint8, n)
	case "[]uint16":
		return make([]uint16, n)
	case "[]uint32":
		return make([]uint32, n)
	case "[]uint64":
		return make([]uint64, n)
	case "[]float32":
		return make([]float32, n)
	case "[]float64":
		return make([]float64, n)
	}
	return nil
}

// raw is the values' little-endian bytes (the protocol's binary data).
func (v Values) raw() ([]byte, error) {
	if want, ok := goType[v.Dtype]; !ok || want != fmt.Sprintf("%T", v.Data) {
		return nil, &Error{Kind: "InputError", Message: fmt.Sprintf("dtype %s holds %s, not %T", v.Dtype, goType[v.Dtype], v.Data)}
	}
	if count := reflect.ValueOf(v.Data).Len(); count != size(v.Shape) {
		return nil, &Error{Kind: "InputError", Message: fmt.Sprintf("%d values, but shape %v holds %d", count, v.Shape, size(v.Shape))}
	}
	var out bytes.Buffer
	if err := binary.Write(&out, binary.LittleEndian, v.Data); err != nil {
		return nil, &Error{Kind: "InputError", Message: err.Error()}
	}
	return out.Bytes(), nil
}

// fromRaw is the values of dtype and shape in little-endian bytes.
func fromRaw(dtype string, shape []int, b []byte) (Values, error) {
	data := newSlice(dtype, size(shape))
	if data == nil || len(b) != binary.Size(data) {
		return Values{}, &Error{Kind: "RemoteError", Message: fmt.Sprintf("the gateway sent %d bytes for %s%v", len(b), dtype, shape)}
	}
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, data); err != nil {
		return Values{}, &Error{Kind: "RemoteError", Message: err.Error()}
	}
	return Values{Shape: shape, Dtype: dtype, Data: data}, nil
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
