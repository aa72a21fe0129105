package example_payment_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sluice "github.com/sluice-go/sluice"
	ep "github.com/sluice-go/sluice/handlers/example_payment"
)

const validBody = `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa"}`

var validRequest = ep.Request{PaymentID: "pay_1", OrderID: "ord_1", AmountCents: 1299, Currency: "EUR", Source: "tok_visa"}

func TestDecode_Valid(t *testing.T) {
	tests := []struct {
		name string
		body string
		want ep.Request
	}{
		{name: "canonical", body: validBody, want: validRequest},
		{
			name: "unknown fields are accepted and ignored",
			body: `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa","customer":{"id":7},"note":null}`,
			want: validRequest,
		},
		{
			name: "white space and field order do not matter",
			body: "\n {\t\"source\" : \"tok_visa\", \"currency\":\"EUR\",\"amount_cents\" :  1299 ,\"order_id\":\"ord_1\",\"payment_id\":\"pay_1\" }\n",
			want: validRequest,
		},
		{
			name: "a repeated field takes its last value",
			body: `{"payment_id":"pay_0","payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa"}`,
			want: validRequest,
		},
		{
			name: "largest int64 amount",
			body: `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":9223372036854775807,"currency":"EUR","source":"tok_visa"}`,
			want: ep.Request{PaymentID: "pay_1", OrderID: "ord_1", AmountCents: 9223372036854775807, Currency: "EUR", Source: "tok_visa"},
		},
		{
			name: "escaped and non-ASCII strings",
			body: `{"payment_id":"pay_\u00e9","order_id":"ord \"1\"","amount_cents":1,"currency":"JPY","source":"tok_visa"}`,
			want: ep.Request{PaymentID: "pay_é", OrderID: `ord "1"`, AmountCents: 1, Currency: "JPY", Source: "tok_visa"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ep.Decode([]byte(tt.body))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// body returns the valid request as JSON with one field replaced by raw JSON, or removed
// when raw is "".
func body(t *testing.T, field, raw string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(validBody), &m))
	if raw == "" {
		delete(m, field)
	} else {
		m[field] = json.RawMessage(raw)
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

func TestDecode_Invalid(t *testing.T) {
	tests := []struct {
		name      string
		body      []byte
		wantType  string
		wantField string   // for validation errors
		wantText  []string // substrings of the error message
	}{
		{name: "empty body", body: nil, wantType: ep.ErrorTypeDecode, wantText: []string{"decode payment request"}},
		{name: "not JSON", body: []byte("pay me"), wantType: ep.ErrorTypeDecode, wantText: []string{"invalid character"}},
		{name: "cut JSON", body: []byte(validBody[:40]), wantType: ep.ErrorTypeDecode, wantText: []string{"unexpected end"}},
		{name: "trailing data", body: []byte(validBody + "{}"), wantType: ep.ErrorTypeDecode},
		{name: "JSON array", body: []byte(`[1,2]`), wantType: ep.ErrorTypeDecode, wantText: []string{"JSON array, want an object"}},
		{name: "JSON string", body: []byte(`"pay_1"`), wantType: ep.ErrorTypeDecode, wantText: []string{"JSON string, want an object"}},
		{name: "JSON null", body: []byte(`null`), wantType: ep.ErrorTypeDecode, wantText: []string{"null"}},
		{name: "empty object", body: []byte(`{}`), wantType: ep.ErrorTypeValidation, wantField: "payment_id", wantText: []string{`"payment_id" is missing`}},

		{name: "missing payment_id", body: body(t, "payment_id", ""), wantType: ep.ErrorTypeValidation, wantField: "payment_id", wantText: []string{`"payment_id" is missing`}},
		{name: "missing order_id", body: body(t, "order_id", ""), wantType: ep.ErrorTypeValidation, wantField: "order_id", wantText: []string{`"order_id" is missing`}},
		{name: "missing amount_cents", body: body(t, "amount_cents", ""), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{`"amount_cents" is missing`}},
		{name: "missing currency", body: body(t, "currency", ""), wantType: ep.ErrorTypeValidation, wantField: "currency", wantText: []string{`"currency" is missing`}},
		{name: "missing source", body: body(t, "source", ""), wantType: ep.ErrorTypeValidation, wantField: "source", wantText: []string{`"source" is missing`}},
		{name: "null source counts as missing", body: body(t, "source", "null"), wantType: ep.ErrorTypeValidation, wantField: "source", wantText: []string{"is missing"}},
		{name: "field names are case-sensitive", body: []byte(`{"Payment_ID":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa"}`), wantType: ep.ErrorTypeValidation, wantField: "payment_id", wantText: []string{"is missing"}},

		{name: "empty payment_id", body: body(t, "payment_id", `""`), wantType: ep.ErrorTypeValidation, wantField: "payment_id", wantText: []string{`"payment_id" is "": must not be empty`}},
		{name: "blank order_id", body: body(t, "order_id", `"  "`), wantType: ep.ErrorTypeValidation, wantField: "order_id", wantText: []string{`"  "`, "must not be empty"}},
		{name: "empty source", body: body(t, "source", `""`), wantType: ep.ErrorTypeValidation, wantField: "source", wantText: []string{"must not be empty"}},
		{name: "payment_id not a string", body: body(t, "payment_id", `42`), wantType: ep.ErrorTypeValidation, wantField: "payment_id", wantText: []string{"is 42", "must be a JSON string"}},
		{name: "currency an object", body: body(t, "currency", `{"code":"EUR"}`), wantType: ep.ErrorTypeValidation, wantField: "currency", wantText: []string{`{"code":"EUR"}`, "JSON string"}},

		{name: "zero amount", body: body(t, "amount_cents", `0`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"is 0", "must be positive"}},
		{name: "negative amount", body: body(t, "amount_cents", `-1299`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"is -1299", "must be positive"}},
		{name: "negative zero amount", body: body(t, "amount_cents", `-0`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"must be positive"}},
		{name: "amount as string", body: body(t, "amount_cents", `"1299"`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{`is "1299"`, "not a string"}},
		{name: "amount as float", body: body(t, "amount_cents", `12.99`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"is 12.99", "without fraction"}},
		{name: "amount as whole float", body: body(t, "amount_cents", `1299.0`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"is 1299.0"}},
		{name: "amount with exponent", body: body(t, "amount_cents", `1e3`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"is 1e3"}},
		{name: "amount beyond int64", body: body(t, "amount_cents", `9223372036854775808`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"out of range"}},
		{name: "amount as bool", body: body(t, "amount_cents", `true`), wantType: ep.ErrorTypeValidation, wantField: "amount_cents", wantText: []string{"is true"}},

		{name: "lower-case currency", body: body(t, "currency", `"eur"`), wantType: ep.ErrorTypeValidation, wantField: "currency", wantText: []string{`is "eur"`, "three capital letters"}},
		{name: "two-letter currency", body: body(t, "currency", `"EU"`), wantType: ep.ErrorTypeValidation, wantField: "currency", wantText: []string{`"EU"`}},
		{name: "four-letter currency", body: body(t, "currency", `"EURO"`), wantType: ep.ErrorTypeValidation, wantField: "currency", wantText: []string{`"EURO"`}},
		{name: "currency with a digit", body: body(t, "currency", `"E1R"`), wantType: ep.ErrorTypeValidation, wantField: "currency"},
		{name: "currency with non-ASCII letter", body: body(t, "currency", `"ÉUR"`), wantType: ep.ErrorTypeValidation, wantField: "currency"},
		{name: "empty currency", body: body(t, "currency", `""`), wantType: ep.ErrorTypeValidation, wantField: "currency"},

		{name: "first bad field is reported", body: []byte(`{"payment_id":"pay_1","order_id":"","amount_cents":-1,"currency":"x","source":""}`), wantType: ep.ErrorTypeValidation, wantField: "order_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ep.Decode(tt.body)
			require.Error(t, err)
			assert.Equal(t, ep.Request{}, got, "a failed Decode returns the zero Request")
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err), "error %v must be permanent", err)
			assert.Equal(t, tt.wantType, sluice.ErrorType(err))
			if tt.wantField != "" {
				var ve *ep.ValidationError
				require.ErrorAs(t, err, &ve)
				assert.Equal(t, tt.wantField, ve.Field)
			} else {
				var de *ep.DecodeError
				require.ErrorAs(t, err, &de)
			}
			for _, s := range tt.wantText {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestDecode_ErrorQuotesBoundedValue(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	_, err := ep.Decode(body(t, "currency", `"`+huge+`"`))
	require.Error(t, err)
	assert.Equal(t, ep.ErrorTypeValidation, sluice.ErrorType(err))
	assert.Less(t, len(err.Error()), 300, "error message must not echo a huge value")
}

func TestRequest_Validate(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(*ep.Request)
		wantField string // "" means valid
	}{
		{name: "valid", mutate: func(*ep.Request) {}},
		{name: "one cent", mutate: func(r *ep.Request) { r.AmountCents = 1 }},
		{name: "empty payment_id", mutate: func(r *ep.Request) { r.PaymentID = "" }, wantField: "payment_id"},
		{name: "tab-only payment_id", mutate: func(r *ep.Request) { r.PaymentID = "\t" }, wantField: "payment_id"},
		{name: "empty order_id", mutate: func(r *ep.Request) { r.OrderID = "" }, wantField: "order_id"},
		{name: "zero amount", mutate: func(r *ep.Request) { r.AmountCents = 0 }, wantField: "amount_cents"},
		{name: "negative amount", mutate: func(r *ep.Request) { r.AmountCents = -5 }, wantField: "amount_cents"},
		{name: "currency lower-case", mutate: func(r *ep.Request) { r.Currency = "usd" }, wantField: "currency"},
		{name: "currency padded", mutate: func(r *ep.Request) { r.Currency = " EUR" }, wantField: "currency"},
		{name: "empty source", mutate: func(r *ep.Request) { r.Source = "" }, wantField: "source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRequest
			tt.mutate(&r)
			err := r.Validate()
			if tt.wantField == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err))
			assert.Equal(t, ep.ErrorTypeValidation, sluice.ErrorType(err))
			var ve *ep.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tt.wantField, ve.Field)
			assert.Contains(t, err.Error(), tt.wantField)
		})
	}
}

func TestValidationError_Error(t *testing.T) {
	tests := []struct {
		name string
		err  ep.ValidationError
		want string
	}{
		{name: "missing", err: ep.ValidationError{Field: "source", Problem: "is missing"}, want: `invalid payment request: field "source" is missing`},
		{name: "with value", err: ep.ValidationError{Field: "currency", Value: `"eur"`, Problem: "must be three capital letters"}, want: `invalid payment request: field "currency" is "eur": must be three capital letters`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.err.Error())
			assert.Equal(t, ep.ErrorTypeValidation, tt.err.ErrorType())
		})
	}
}

func TestDecodeError_Unwrap(t *testing.T) {
	_, err := ep.Decode([]byte("{"))
	var de *ep.DecodeError
	require.ErrorAs(t, err, &de)
	var syntax *json.SyntaxError
	assert.True(t, errors.As(err, &syntax), "the decoder's *json.SyntaxError is kept: %v", de.Err)
}

// FuzzDecode checks that Decode never panics and either returns a request that validates
// and survives a JSON round trip, or a permanent decode/validation error.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		validBody,
		`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa","extra":[1,{"a":null}]}`,
		`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":"1299","currency":"EUR","source":"tok_visa"}`,
		`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":12.99,"currency":"EUR","source":"tok_visa"}`,
		`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":-1,"currency":"eur","source":""}`,
		`{"payment_id":"\ud800","order_id":"\u0000","amount_cents":1,"currency":"ABC","source":"tok_panic"}`,
		`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":99999999999999999999,"currency":"EUR","source":"tok_visa"}`,
		`{"payment_id":null}`,
		`{}`, `[]`, `null`, `"x"`, `1`, ``, `{`, "{\"payment_id\":\"\xff\"}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ep.Decode(data)
		if err != nil {
			if sluice.ClassOf(err) != sluice.ClassPermanent {
				t.Fatalf("Decode(%q) error %v is not permanent", data, err)
			}
			if typ := sluice.ErrorType(err); typ != ep.ErrorTypeDecode && typ != ep.ErrorTypeValidation {
				t.Fatalf("Decode(%q) error type %q, want decode or validation", data, typ)
			}
			if req != (ep.Request{}) {
				t.Fatalf("Decode(%q) returned %+v with error %v", data, req, err)
			}
			return
		}
		if verr := req.Validate(); verr != nil {
			t.Fatalf("Decode(%q) returned invalid request %+v: %v", data, req, verr)
		}
		encoded, merr := json.Marshal(req)
		if merr != nil {
			t.Fatalf("encode %+v: %v", req, merr)
		}
		again, derr := ep.Decode(encoded)
		if derr != nil {
			t.Fatalf("re-decode of %s: %v", encoded, derr)
		}
		if again != req {
			t.Fatalf("round trip changed the request: %+v -> %+v", req, again)
		}
	})
}
