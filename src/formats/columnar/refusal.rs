//! Why a record has no row: the message, and the field it is about as a path
//! (`ship.weight`, `tags[]` for an array's items, `attrs{}` for a map's values).

/// Why a record is refused. Small (one pointer) so that results stay cheap to pass
/// back on the common path, where there is none.
#[derive(Debug)]
pub struct Refusal(Box<Inner>);

#[derive(Debug)]
struct Inner {
    /// The steps from the record to the value, innermost first.
    path: Vec<Step>,
    message: String,
    /// The text is not JSON: no field to name, the record as a whole is refused.
    syntax: bool,
}

#[derive(Debug)]
enum Step {
    Field(String),
    Item,
    MapValue,
}

impl Refusal {
    /// A value the column cannot take.
    #[cold]
    pub fn value(message: impl Into<String>) -> Refusal {
        Refusal(Box::new(Inner {
            path: Vec::new(),
            message: message.into(),
            syntax: false,
        }))
    }

    /// The text is not one JSON object.
    #[cold]
    pub fn syntax(message: impl Into<String>) -> Refusal {
        Refusal(Box::new(Inner {
            path: Vec::new(),
            message: message.into(),
            syntax: true,
        }))
    }

    /// This refusal, about the value inside field `name`.
    #[cold]
    pub fn in_field(mut self, name: &str) -> Refusal {
        if !self.0.syntax {
            self.0.path.push(Step::Field(name.to_string()));
        }
        self
    }

    /// This refusal, about the value inside an array's item.
    #[cold]
    pub fn in_item(mut self) -> Refusal {
        if !self.0.syntax {
            self.0.path.push(Step::Item);
        }
        self
    }

    /// This refusal, about the value inside a map's value.
    #[cold]
    pub fn in_map_value(mut self) -> Refusal {
        if !self.0.syntax {
            self.0.path.push(Step::MapValue);
        }
        self
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.syntax {
            return write!(f, "the value is not one JSON object: {}", self.0.message);
        }
        if self.0.path.is_empty() {
            return f.write_str(&self.0.message);
        }
        for (k, step) in self.0.path.iter().rev().enumerate() {
            match step {
                Step::Field(name) if k == 0 => f.write_str(name)?,
                Step::Field(name) => write!(f, ".{name}")?,
                Step::Item => f.write_str("[]")?,
                Step::MapValue => f.write_str("{}")?,
            }
        }
        write!(f, ": {}", self.0.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_names_the_field() {
        let r = Refusal::value("2.5 is not an integer")
            .in_item()
            .in_field("lines")
            .in_map_value()
            .in_field("x");
        assert_eq!(r.to_string(), "x{}.lines[]: 2.5 is not an integer");
        let r = Refusal::syntax("a string is not closed at byte 3").in_field("x");
        assert_eq!(
            r.to_string(),
            "the value is not one JSON object: a string is not closed at byte 3"
        );
    }
}
