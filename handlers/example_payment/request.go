package example_payment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	sluice "github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/failure"
)

// Error types of the requests this handler refuses, as sluice.ErrorType reports them.
const (
	// ErrorTypeDecode is the type of a body that is not a JSON object.
	ErrorTypeDecode = "decode"
	// ErrorTypeValidation is the type of a JSON object whose fields are missing, of the
	// wrong JSON type, or out of range.
	ErrorTypeValidation = "validation"
)

// maxValueInError bounds how much of an offending value an error message quotes, so that a
// huge field cannot make a huge error (and failure record).
const maxValueInError = 64

// Request is a payment request, the body of a message on QueueRequested:
//
//	{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa"}
//
// Every field is required. Fields the request does not know are accepted and ignored, so a
// producer may add fields before this consumer knows them.
type Request struct {
	// PaymentID identifies the payment; it is the idempotency key (see KeyFunc).
	PaymentID string `json:"payment_id"`
	// OrderID is the order the payment is for.
	OrderID string `json:"order_id"`
	// AmountCents is the amount in the currency's minor unit; it must be a positive JSON
	// integer (not a string, not a number with a fraction or an exponent).
	AmountCents int64 `json:"amount_cents"`
	// Currency is an ISO 4217 style code: exactly three capital ASCII letters. It is not
	// checked against the list of real currencies.
	Currency string `json:"currency"`
	// Source is the card token; the simulated Gateway decides by it (see Gateway.Charge).
	Source string `json:"source"`
}

// decodeError reports a body that is not a JSON object. Decode returns it wrapped in
// sluice.Permanent: no retry can fix the bytes of a message.
type decodeError struct {
	// Err is what the JSON decoder reported.
	Err error
}

// Error says why the body could not be decoded.
func (e *decodeError) Error() string { return "decode payment request: " + e.Err.Error() }

// Unwrap returns the decoder's error.
func (e *decodeError) Unwrap() error { return e.Err }

// ErrorType returns ErrorTypeDecode.
func (e *decodeError) ErrorType() string { return ErrorTypeDecode }

// validationError reports the first field of a request that is missing or invalid. Decode
// and Request.Validate return it wrapped in sluice.Permanent.
type validationError struct {
	// Field is the JSON name of the field, for example "currency".
	Field string
	// Value is the offending value as the producer sent it: a quoted string, or the raw
	// JSON of a value of the wrong type; empty when the field is missing. It is cut to a
	// bounded length.
	Value string
	// Problem says what is wrong, for example "must be three capital letters".
	Problem string
}

// Error names the field, the value and the problem.
func (e *validationError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("invalid payment request: field %q %s", e.Field, e.Problem)
	}
	return fmt.Sprintf("invalid payment request: field %q is %s: %s", e.Field, e.Value, e.Problem)
}

// ErrorType returns ErrorTypeValidation.
func (e *validationError) ErrorType() string { return ErrorTypeValidation }

func invalid(field, value, problem string) error {
	return sluice.Permanent(&validationError{Field: field, Value: value, Problem: problem})
}

// quote renders a string value for an error message, bounded.
func quote(s string) string { return strconv.Quote(failure.Truncate(s, maxValueInError)) }

// Decode parses and validates a payment request. Any error it returns is permanent
// (sluice.Permanent) and carries a *decodeError when body is not a JSON object, or a
// *validationError naming the first bad field and its value.
//
// Field names match exactly (JSON is case-sensitive here, unlike encoding/json's default),
// a null field counts as missing, and when a name appears twice the last one wins.
func Decode(body []byte) (Request, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			err = fmt.Errorf("body is a JSON %s, want an object", te.Value)
		}
		return Request{}, sluice.Permanent(&decodeError{Err: err})
	}
	if fields == nil {
		return Request{}, sluice.Permanent(&decodeError{Err: errors.New("body is JSON null, want an object")})
	}

	var r Request
	var err error
	if r.PaymentID, err = stringField(fields, paymentsim.FieldPaymentID); err != nil {
		return Request{}, err
	}
	if r.OrderID, err = stringField(fields, paymentsim.FieldOrderID); err != nil {
		return Request{}, err
	}
	if r.AmountCents, err = amountField(fields); err != nil {
		return Request{}, err
	}
	if r.Currency, err = stringField(fields, paymentsim.FieldCurrency); err != nil {
		return Request{}, err
	}
	if r.Source, err = stringField(fields, paymentsim.FieldSource); err != nil {
		return Request{}, err
	}
	if err := r.Validate(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// present returns the raw value of a field, or nil when it is absent or null.
func present(fields map[string]json.RawMessage, name string) json.RawMessage {
	raw, ok := fields[name]
	if !ok || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	return raw
}

func stringField(fields map[string]json.RawMessage, name string) (string, error) {
	raw := present(fields, name)
	if raw == nil {
		return "", invalid(name, "", "is missing")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", invalid(name, failure.Truncate(string(raw), maxValueInError), "must be a JSON string")
	}
	return s, nil
}

func amountField(fields map[string]json.RawMessage) (int64, error) {
	raw := present(fields, paymentsim.FieldAmountCents)
	if raw == nil {
		return 0, invalid(paymentsim.FieldAmountCents, "", "is missing")
	}
	shown := failure.Truncate(string(raw), maxValueInError)
	switch raw[0] {
	case '"':
		return 0, invalid(paymentsim.FieldAmountCents, shown, "must be a JSON integer number of cents, not a string")
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
	default:
		return 0, invalid(paymentsim.FieldAmountCents, shown, "must be a JSON integer number of cents")
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, invalid(paymentsim.FieldAmountCents, shown, "is out of range")
		}
		// A valid JSON number that ParseInt rejects has a fraction or an exponent.
		return 0, invalid(paymentsim.FieldAmountCents, shown, "must be an integer number of cents, without fraction or exponent")
	}
	return n, nil
}

// Validate checks the values of a request, in field order, and returns the first problem
// as a permanent *validationError. An identifier is invalid when it is empty or only
// white space. Validate cannot tell a missing field from an empty one; Decode can, and
// says "is missing".
func (r Request) Validate() error {
	if strings.TrimSpace(r.PaymentID) == "" {
		return invalid(paymentsim.FieldPaymentID, quote(r.PaymentID), "must not be empty")
	}
	if strings.TrimSpace(r.OrderID) == "" {
		return invalid(paymentsim.FieldOrderID, quote(r.OrderID), "must not be empty")
	}
	if r.AmountCents <= 0 {
		return invalid(paymentsim.FieldAmountCents, strconv.FormatInt(r.AmountCents, 10), "must be positive")
	}
	if !isCurrencyCode(r.Currency) {
		return invalid(paymentsim.FieldCurrency, quote(r.Currency), "must be three capital letters A-Z, like \"EUR\"")
	}
	if strings.TrimSpace(r.Source) == "" {
		return invalid(paymentsim.FieldSource, quote(r.Source), "must not be empty")
	}
	return nil
}

func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
