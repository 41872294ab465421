//! Unit words after a number: which words are units, and their canonical names, so that
//! `5\text{ cm}` and `5 centimeters` agree while `5 cm` and `5\text{ m}` do not.
//!
//! What this is not: unit conversion. `500 cm` is not `5 m`; a prediction whose units differ
//! from the gold's is wrong, and one with no unit (or a unit this table does not know, such as
//! "apples") is compared by its number alone.
//!
//! Invariants: lookups are over fixed tables; every canonical name is one of the table's.

/// (canonical name, spellings). Spellings are lowercase; plurals are listed, not derived.
const UNITS: &[(&str, &[&str])] = &[
    (
        "mm",
        &[
            "mm",
            "millimeter",
            "millimeters",
            "millimetre",
            "millimetres",
        ],
    ),
    (
        "cm",
        &[
            "cm",
            "centimeter",
            "centimeters",
            "centimetre",
            "centimetres",
        ],
    ),
    ("m", &["meter", "meters", "metre", "metres"]),
    (
        "km",
        &["km", "kilometer", "kilometers", "kilometre", "kilometres"],
    ),
    ("in", &["inch", "inches"]),
    ("ft", &["ft", "foot", "feet"]),
    ("yd", &["yd", "yard", "yards"]),
    ("mi", &["mi", "mile", "miles"]),
    ("mg", &["mg", "milligram", "milligrams"]),
    ("g", &["gram", "grams"]),
    ("kg", &["kg", "kilogram", "kilograms", "kilo", "kilos"]),
    ("lb", &["lb", "lbs", "pound", "pounds"]),
    ("oz", &["oz", "ounce", "ounces"]),
    (
        "ml",
        &[
            "ml",
            "milliliter",
            "milliliters",
            "millilitre",
            "millilitres",
        ],
    ),
    ("l", &["liter", "liters", "litre", "litres"]),
    ("gal", &["gal", "gallon", "gallons"]),
    ("s", &["sec", "secs", "second", "seconds"]),
    ("min", &["min", "mins", "minute", "minutes"]),
    ("h", &["hr", "hrs", "hour", "hours"]),
    ("day", &["day", "days"]),
    ("week", &["week", "weeks"]),
    ("month", &["month", "months"]),
    ("year", &["year", "years", "yr", "yrs"]),
    ("deg", &["degree", "degrees", "deg"]),
    ("rad", &["radian", "radians", "rad"]),
    ("cent", &["cent", "cents"]),
];

/// Symbols accepted as units only right after a number written without a space (`5m²`).
const SYMBOLS: &[(&str, &str)] = &[("m", "m"), ("g", "g"), ("l", "l"), ("s", "s"), ("h", "h")];

/// Words that may follow a number as a unit without changing its value (the known units,
/// currency words and counted things).
const OTHER_UNIT_WORDS: &[&str] = &[
    "dollar", "dollars", "usd", "euro", "euros", "eur", "yuan", "rs", "rupees", "units", "unit",
    "square", "sq", "cubic", "percent",
];

/// Words that qualify or hedge a value ("at least", "less than", "not", "approximately").
const QUALIFIERS: &[&str] = &[
    "not",
    "least",
    "most",
    "than",
    "less",
    "more",
    "greater",
    "fewer",
    "smaller",
    "larger",
    "about",
    "approximately",
    "approx",
    "around",
    "nearly",
    "almost",
    "roughly",
    "either",
    "neither",
    "nor",
    "maybe",
    "perhaps",
    "possibly",
    "probably",
    "between",
    "under",
    "over",
    "exceed",
    "exceeds",
    "except",
    "below",
    "above",
    "within",
    "guess",
    "isn't",
    "never",
];

/// Whether `word` (lowercase) qualifies or hedges the value next to it.
pub fn is_qualifier(word: &str) -> bool {
    QUALIFIERS.contains(&word)
}

/// `cm` squared is `cm^2`: areas and volumes are different units from lengths.
pub fn powered(unit: &'static str, power: u32) -> &'static str {
    const POWERED: &[(&str, &str, &str)] = &[
        ("mm", "mm^2", "mm^3"),
        ("cm", "cm^2", "cm^3"),
        ("m", "m^2", "m^3"),
        ("km", "km^2", "km^3"),
        ("in", "in^2", "in^3"),
        ("ft", "ft^2", "ft^3"),
        ("yd", "yd^2", "yd^3"),
        ("mi", "mi^2", "mi^3"),
    ];
    POWERED
        .iter()
        .find(|(base, _, _)| *base == unit)
        .map_or(unit, |(_, two, three)| if power == 2 { two } else { three })
}

/// The canonical name of a unit word, `None` when the word is not a known unit.
pub fn canonical_unit(word: &str) -> Option<&'static str> {
    let lower = word.to_ascii_lowercase();
    UNITS
        .iter()
        .find(|(_, spellings)| spellings.contains(&lower.as_str()))
        .map(|(canonical, _)| *canonical)
}

/// The canonical name of a unit written as a `\text{...}` symbol (`\text{ m}`, `\mathrm{kg}`).
pub fn canonical_symbol(word: &str) -> Option<&'static str> {
    canonical_unit(word).or_else(|| {
        SYMBOLS
            .iter()
            .find(|(symbol, _)| *symbol == word)
            .map(|(_, canonical)| *canonical)
    })
}

/// Whether `word`, written right after a number, is a unit (so the number is standalone).
pub fn is_unit_word(word: &str) -> bool {
    canonical_symbol(word).is_some() || OTHER_UNIT_WORDS.contains(&word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_share_a_canonical_name_and_different_units_differ() {
        assert_eq!(canonical_unit("Centimeters"), Some("cm"));
        assert_eq!(canonical_unit("cm"), canonical_unit("centimetre"));
        assert_ne!(canonical_symbol("m"), canonical_unit("cm"));
        assert_eq!(canonical_unit("apples"), None);
    }
}
